# The Nix image's layout, labels and runtime config for one stack: pure data (builtins only), so
# `nix eval .#lib.image.<stack>` and the offline checks can compare it with the Containerfile,
# speclock.core.layout and speclock.build.labels.labels_for (docs/labels.md) without nixpkgs.
{ root, containerfile, revision }:
let
  u = import ./util.nix;
  cf = containerfile;
  home = cf.home;

  readMatch = path: regex: what:
    let
      hits = builtins.filter builtins.isList (builtins.split regex (builtins.readFile (root + path)));
    in
    if hits == [ ] then u.fail "${path}: cannot find ${what}" else builtins.head (builtins.head hits);

  version = readMatch "/src/speclock/__init__.py" "__version__ = \"([^\"]+)\"" "__version__";
  # speclock.build.labels.source_url's default (used when neither SPECLOCK_SOURCE_URL nor a git remote is set).
  sourceUrl = readMatch "/src/speclock/build/labels.py" "DEFAULT_SOURCE_URL = \"(https://[^\"]+)\"" "DEFAULT_SOURCE_URL";
  labelPrefix = readMatch "/src/speclock/build/labels.py" "LABEL_PREFIX = \"([^\"]+)\"" "LABEL_PREFIX";
  licenses = readMatch "/src/speclock/build/labels.py" "LICENSES = \"([^\"]+)\"" "LICENSES";
  # flake.nix gives "dirty" for a flake of a dirty tree (Nix 2.8 has no dirtyRev); labels.is_dirty's "+dirty" too.
  dirty = if revision == "dirty" || builtins.match ".*[+]dirty" revision != null then "true" else "false";
  # The patches label's key, as speclock.patches.series.series_label gives it.
  patchesKey = readMatch "/src/speclock/patches/series.py" "LABEL_KEY = \"([^\"]+)\"" "LABEL_KEY";
  # Its value: `name@sha12` of each patch file in series order (series_label), "none" for no series.
  patchesValue = s:
    let
      entry = p: "${baseNameOf p}@${builtins.substring 0 12 (builtins.hashFile "sha256" (root + "/patches/${s.engine.name}/${p}"))}";
    in
    if s.patches == [ ] then "none" else builtins.concatStringsSep "," (map entry s.patches);

  # Paths inside the image; speclock.core.layout.ImageLayout reads them (tests/test_nix_flake.py compares).
  layout = stackName: {
    venv = cf.venv;
    root = home;
    stack_file = "${home}/stacks/${stackName}.toml";
    lock_file = "${home}/lock.json";
    target_dir = "${home}/target";
    draft_dir = "${home}/draft";
    prompts_file = "${home}/prompts/prompts.jsonl";
    patches_dir = "${home}/patches";
    baselines_dir = "${home}/baselines";
    build_info = "${home}/image.json";
    patches_applied = "${home}/patches-applied.json";
    src = "${home}/src";
  };

  # Every COPY destination of the Containerfile's runtime stage, and what provides it here.
  providedDestinations = l: {
    "${l.venv}" = "venv (locked wheels, patch series applied)";
    "${l.patches_applied}" = "the patch record of the venv build";
    "${l.target_dir}" = "assets: the target GGUF converted by speclock.drafter.models";
    "${builtins.dirOf l.prompts_file}" = "assets: the smoke prompts";
    "${l.draft_dir}" = "the stack's draft.path from the flake source";
    "${l.patches_dir}" = "the stack's patch series";
    "${l.root}" = "config: stacks/<name>.toml, lock.json, baselines/, image.json";
    "${l.src}" = "src/speclock, compiled with checked-hash .pyc";
  };

  # Hash of what reaches the image (the Nix analogue of speclock.build.inputs.inputs_hash; it is not
  # the same number, because the Nix image has a different base).
  inputsFor = s:
    builtins.hashString "sha256" (builtins.concatStringsSep "\n" [
      "lock:${s.lockSha256}"
      "containerfile:${builtins.hashFile "sha256" (root + "/containers/Containerfile")}"
      "nix:${builtins.hashFile "sha256" (root + "/nix/image.nix")}"
      "src:${builtins.hashString "sha256" (builtins.unsafeDiscardStringContext (toString (builtins.path { path = root + "/src"; name = "speclock-src"; })))}"
    ]);

  for = s:
    let
      inputs = inputsFor s;
      tag = builtins.substring 0 16 inputs;
      l = layout s.name;
      joinOr = xs: if xs == [ ] then "none" else builtins.concatStringsSep "," xs;
    in
    rec {
      inherit tag inputs version;
      name = "localhost/speclock-${s.name}";
      ref = "${name}:${tag}";
      created = u.isoUtc s.sourceDateEpoch;
      layout = l;
      destinations = providedDestinations l;
      # The same keys as speclock.build.labels.labels_for; values from the lock.
      labels = {
        "org.opencontainers.image.title" = "speclock-${s.name}";
        "org.opencontainers.image.description" = s.description;
        "org.opencontainers.image.source" = sourceUrl;
        "org.opencontainers.image.revision" = revision;
        "org.opencontainers.image.created" = created;
        "org.opencontainers.image.documentation" = "${sourceUrl}#readme";
        "org.opencontainers.image.licenses" = licenses;
        # What the image packages: the engine's version, the content tag as build metadata.
        "org.opencontainers.image.version" = "${s.engine.version}+${tag}";
        # No base image: the Nix image is built from nixpkgs store paths (not the locked Debian rootfs).
        "org.opencontainers.image.base.name" = "nixpkgs";
        "org.opencontainers.image.base.digest" = "none";
        "${labelPrefix}.speclock-version" = version;
        "${labelPrefix}.dirty" = dirty;
        "${labelPrefix}.stack" = s.name;
        "${labelPrefix}.inputs-sha256" = inputs;
        "${labelPrefix}.lock-sha256" = s.lockSha256;
        "${labelPrefix}.engine" = s.engine.name;
        "${labelPrefix}.engine-package" = s.engine.package;
        "${labelPrefix}.engine-version" = s.engine.version;
        "${labelPrefix}.torch-version" = s.torch.version;
        "${labelPrefix}.cuda" = if s.cuda == "" then "none" else s.cuda;
        "${labelPrefix}.archs" = joinOr s.archs;
        "${patchesKey}" = patchesValue s;
        # The Nix image's base is nixpkgs, not the locked Debian rootfs: say so instead of
        # claiming the Debian digest.
        "${labelPrefix}.base" = "nixpkgs";
        # The Nix venv installs the lock's packages (no pruned one) but runs no path prune: it claims the packages only.
        "${labelPrefix}.prune" = if s.prune.packages == [ ] then "none" else builtins.toJSON { packages = s.prune.packages; paths = [ ]; };
      };
      config = {
        Env = map (k: "${k}=${cf.env.${k}}") (builtins.attrNames cf.env);
        User = cf.user;
        WorkingDir = cf.workdir;
        Entrypoint = cf.entrypoint;
        Cmd = cf.cmd;
        Labels = labels;
      };
      passwd = cf.passwd;
      group = cf.group;
      # What config/image.json holds in a buildah/docker build, for this build.
      info = {
        stack = s.name;
        inherit tag ref;
        inputs_sha256 = inputs;
        lock_sha256 = s.lockSha256;
        inherit labels;
        patches = s.patches;
        builder = "nix";
      };
    };
in
{
  inherit layout version sourceUrl labelPrefix patchesKey for;
  # Drift between the Containerfile and the Nix image, in both directions: every COPY
  # destination of the runtime stage must be provided here, and every path provided here must
  # appear in the Containerfile (created by a RUN, a COPY or a parent stage).
  destinationProblems =
    let
      provided = builtins.attrNames (providedDestinations (layout "STACK"));
      copied = cf.copyDestinations;
      mentioned = d: builtins.length (builtins.split "(^|[^A-Za-z0-9_./-])${builtins.replaceStrings [ "." ] [ "\\." ] d}([^A-Za-z0-9_.-]|$)" cf.text) > 1;
    in
    map (d: "containers/Containerfile copies to ${d} in the runtime stage, which the Nix image (nix/image.nix) does not provide") (builtins.filter (d: !(builtins.elem d provided)) copied)
    ++ map (d: "nix/image.nix provides ${d}, which containers/Containerfile never mentions") (builtins.filter (d: !(mentioned d)) provided);
}
