"""`speclock schemas [--check]`: the published JSON Schema files (schemas/ in speclock's source), generated from the
document models, so a user's CI can validate a report, a gate result, a lock, an attestation's statement or a stack
file (parsed from TOML) without speclock.

Each file is speclock.core.docmodel.json_schema of one document; tests/test_doc_models.py fails when a committed
file differs from what the models give (run `speclock schemas` and commit the result).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speclock.core.docmodel import SCHEMAS_DIR, DocModel, write_schemas
from speclock.core.errors import BadInput
from speclock.core.layout import IMPORT_ROOT
from speclock.spec.lock import LOCK
from speclock.spec.schema import STACK
from speclock.verify.attest import ATTESTATION
from speclock.verify.gate_result import GATE_RESULT
from speclock.verify.report import REPORT

DOCUMENTS: tuple[DocModel, ...] = (REPORT, GATE_RESULT, LOCK, ATTESTATION, STACK)
SOURCE_ROOT = IMPORT_ROOT.parent  # the checkout: src/ and schemas/ side by side


def _cmd_schemas(args: argparse.Namespace) -> int:
    root = Path(args.dir).parent if args.dir else SOURCE_ROOT
    if args.dir and Path(args.dir).name != SCHEMAS_DIR:
        raise BadInput(f"--dir {args.dir}: the folder must be named {SCHEMAS_DIR}/", hint=f"give .../{SCHEMAS_DIR}")
    stale = write_schemas(list(DOCUMENTS), root, check=args.check)
    for doc in DOCUMENTS:
        path = root / SCHEMAS_DIR / doc.schema_file
        state = ("differs from the model" if args.check else "written") if path in stale else "up to date"
        print(f"{path}: {doc.schema_id} {state}")
    if args.check and stale:
        print("the committed schemas differ from the models: run `speclock schemas` and commit schemas/", file=sys.stderr)
        return 1
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "schemas",
        help="write the JSON Schema files (schemas/) from the document models",
        description="Generate schemas/report.schema.json, schemas/gate-result.schema.json, schemas/lock.schema.json, "
        "schemas/attestation-predicate.schema.json and schemas/stack.schema.json from the typed models speclock "
        "validates those documents with (speclock.verify.report_types, speclock.spec.lock_types, speclock.verify.attest, "
        "speclock.spec.stack_types). Exit 0 written or up to date, "
        "1 with --check when a file differs from the models.",
    )
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs from the models")
    p.add_argument("--dir", help=f"the {SCHEMAS_DIR}/ folder to write (default: the one in speclock's source tree)")
    p.set_defaults(func=_cmd_schemas)
