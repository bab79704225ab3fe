"""Doctor's weights check: the target's and the drafter's safetensors files are whole and fit their configs (headers,
dtypes, byte ranges inside the file, the shapes config.json fixes), read by their headers alone
(speclock.drafter.weights_check): a damaged drafter fails here, before an engine spends minutes loading it."""

from __future__ import annotations

from pathlib import Path

from speclock.core.errors import BadInput
from speclock.drafter.models import read_model_config
from speclock.drafter.weights_check import check_model_weights
from speclock.verify.doctor.context import Check, Context, Question

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def _any_weights(folder: str | Path) -> bool:
    return any(next(Path(folder).glob(pattern), None) is not None for pattern in WEIGHT_PATTERNS)


class Weights:
    name = "weights"
    needs_engine = False

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {}

    def run(self, ctx: Context) -> Check:
        seen, missing = [], []
        for what, folder in (("target", ctx.target_dir), ("drafter", ctx.draft_dir)):
            if not folder or not Path(folder).is_dir() or not list(Path(folder).glob("*.safetensors")):
                # A drafter folder with a config and no weights in any format is a copy that lost its weights: the
                # engine would start, then die loading it minutes later. (A target may be loaded from elsewhere.)
                if what == "drafter" and folder and (Path(folder) / "config.json").is_file() and not _any_weights(folder):
                    return Check(
                        self.name,
                        "fail",
                        f"the drafter folder {folder} has config.json but no weights (*.safetensors, *.bin, *.pt, *.gguf): "
                        "copy the drafter's weight files next to its config",
                    )
                missing.append(f"{what} ({folder})")
                continue
            try:
                n = check_model_weights(folder, read_model_config(folder, what=what), what=what)
            except BadInput as err:
                return Check(self.name, "fail", str(err).splitlines()[0])
            seen.append(f"{what}: {n} tensors")
        if missing and not seen:
            return Check(self.name, "warn", f"no safetensors weights to check: {', '.join(missing)}")
        note = f"; not checked: {', '.join(missing)}" if missing else ""
        return Check(self.name, "pass", f"headers, sizes and config shapes agree ({', '.join(seen)}){note}")
