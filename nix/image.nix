# One stack's image, built with nixpkgs' dockerTools, mirroring containers/Containerfile stage by
# stage (venv -> patched -> assets -> runtime): the same locked wheels installed offline with
# --require-hashes, the same patch series applied by `speclock patches apply`, the same target
# conversion, the same layout, labels, user 10001 and entrypoint `python -m speclock`.
# The base differs: nixpkgs' Python and glibc instead of the locked Debian rootfs (the
# io.speclock.base label says "nixpkgs"). Built only where nixpkgs is reachable.
{ pkgs, root, stack, image, wheels }:
let
  u = import ./util.nix;
  s = stack;
  img = image;
  concat = builtins.concatStringsSep;

  python = pkgs.${s.python.nixAttr} or (u.fail
    "stack ${s.name}: key python.version is ${s.python.version}, but the pinned nixpkgs has no ${s.python.nixAttr}; update the nixpkgs input (flake.lock)");

  epoch = toString s.sourceDateEpoch;
  reqLine = w: "${w.name}==${w.version} --hash=sha256:${w.sha256}\n";

  # The build context's wheels/: the fetched wheels by file name, requirements.txt, assets.txt.
  wheelhouse = pkgs.runCommand "speclock-${s.name}-wheelhouse"
    {
      requirements = concat "" (map reqLine s.wheels);
      assets = concat "" (map reqLine s.assets);
      passAsFile = [ "requirements" "assets" ];
    } ''
    mkdir -p $out
    ${concat "\n" (map (w: "ln -s ${wheels.fetchWheel w} $out/${w.filename}") (s.wheels ++ s.assets))}
    cp "$requirementsPath" $out/requirements.txt
    cp "$assetsPath" $out/assets.txt
  '';

  seriesDir = root + "/patches/${s.engine.name}";
  patchFiles = map
    (p: if builtins.pathExists (seriesDir + "/${p}") then { name = p; path = seriesDir + "/${p}"; }
    else u.fail "stack ${s.name}: key patches.series names ${p}, which is not in patches/${s.engine.name}/ (or not git-tracked)")
    s.patches;
  patches = pkgs.runCommand "speclock-${s.name}-patches" { } ''
    mkdir -p $out
    ${concat "\n" (map (p: "cp ${p.path} $out/${p.name}") patchFiles)}
  '';

  src = builtins.path { path = root + "/src"; name = "speclock-src"; };

  # Stages venv + patched: one derivation, the patch record as a second output.
  venv = pkgs.stdenv.mkDerivation {
    pname = "speclock-${s.name}-venv";
    version = s.engine.version;
    outputs = [ "out" "record" ];
    dontUnpack = true;
    dontConfigure = true;
    dontInstall = true;
    # Stripping prebuilt wheels' libraries can break them (nixpkgs' torch-bin does not strip either).
    dontStrip = true;
    nativeBuildInputs = [ python pkgs.autoPatchelfHook ];
    # Manylinux wheels expect these from the system; nixpkgs provides them by store path.
    buildInputs = [ pkgs.stdenv.cc.cc.lib pkgs.numactl pkgs.zlib ];
    # The GPU driver's libraries come from the host at run time, not from the image.
    autoPatchelfIgnoreMissingDeps = [ "libcuda.so.1" "libnvidia-ml.so.1" ];
    appendRunpaths = [ "/run/opengl-driver/lib" "/usr/lib/x86_64-linux-gnu" "/usr/lib64" ];
    SOURCE_DATE_EPOCH = epoch;
    PATCH_SERIES = concat " " s.patches;
    buildPhase = ''
      runHook preBuild
      python3 -m venv $out
      mkdir -p $record
      $out/bin/python -m pip install --no-index --no-deps --require-hashes --no-cache-dir \
        --disable-pip-version-check --progress-bar off --find-links ${wheelhouse} -r ${wheelhouse}/requirements.txt
      if [ -n "$PATCH_SERIES" ]; then
        PYTHONPATH=${src} $out/bin/python -m speclock patches apply --series-dir ${patches} \
          --site-packages $out/lib/python3*/site-packages --record $record/patches-applied.json $PATCH_SERIES
      else
        echo '{"applied": []}' > $record/patches-applied.json
      fi
      $out/bin/python -m pip uninstall -y -q pip
      runHook postBuild
    '';
  };

  # Stage assets: the target GGUF converted to a Hugging Face folder, and the smoke prompts.
  assets = pkgs.stdenv.mkDerivation {
    name = "speclock-${s.name}-assets";
    dontUnpack = true;
    dontConfigure = true;
    dontInstall = true;
    nativeBuildInputs = [ python ];
    SOURCE_DATE_EPOCH = epoch;
    HF_HUB_OFFLINE = "1";
    buildPhase = ''
      runHook preBuild
      export HOME=$TMPDIR
      python3 -m venv $TMPDIR/pipenv
      $TMPDIR/pipenv/bin/python -m pip install --no-index --no-deps --require-hashes --no-cache-dir \
        --disable-pip-version-check --progress-bar off --target $TMPDIR/assets --find-links ${wheelhouse} -r ${wheelhouse}/assets.txt
      mkdir -p $out/prompts
      cp "$TMPDIR/assets/${s.smoke.prompts_file or ""}" $out/prompts/prompts.jsonl
      PYTHONPATH=${src}:$TMPDIR/assets ${venv}/bin/python -m speclock.drafter.gguf_convert \
        --gguf "$TMPDIR/assets/${s.target.gguf or ""}" --out $out/target --dtype "${s.target.dtype or "bfloat16"}"
      runHook postBuild
    '';
  };

  draftPath = s.draft.path or "";
  draftSrc = root + "/${draftPath}";
  copyDraft =
    if draftPath != "" && builtins.pathExists (draftSrc + "/config.json") then "cp -r ${builtins.path { path = draftSrc; name = "speclock-draft"; }} $home/draft"
    else ''echo "speclock: stack ${s.name}: key draft.path (${draftPath}) has no config.json in the flake source (only git-tracked files are visible); export the drafter and git add it" >&2; exit 1'';
  baselines = root + "/baselines/${s.name}";
  l = img.layout;

  # Stage runtime: the file tree of the image (venv linked at /opt/venv, everything else under /opt/speclock).
  tree = pkgs.runCommand "speclock-${s.name}-root"
    {
      SOURCE_DATE_EPOCH = epoch;
      imageInfo = builtins.toJSON img.info;
      passwd = "root:x:0:0:root:/root:/usr/sbin/nologin\n${img.passwd}\n";
      group = "root:x:0:\n${img.group}\n";
      passAsFile = [ "imageInfo" "passwd" "group" ];
    } ''
    home=$out${l.root}
    mkdir -p $home/stacks $out/etc $(dirname $out${l.venv})
    ln -s ${venv} $out${l.venv}
    cp ${venv.record}/patches-applied.json $out${l.patches_applied}
    cp -r ${assets}/target $out${l.target_dir}
    cp -r ${assets}/prompts $(dirname $out${l.prompts_file})
    ${copyDraft}
    cp -r ${patches} $out${l.patches_dir}
    cp ${root + "/${s.stackFile}"} $out${l.stack_file}
    cp ${root + "/${s.lockFile}"} $out${l.lock_file}
    ${if builtins.pathExists baselines then "cp -r ${builtins.path { path = baselines; name = "speclock-baselines"; }} $out${l.baselines_dir}" else ""}
    cp "$imageInfoPath" $out${l.build_info}
    cp -r ${src} $out${l.src}
    chmod -R u+w $home
    ${venv}/bin/python -m compileall -q --invalidation-mode checked-hash $out${l.src}
    cp "$passwdPath" $out/etc/passwd
    cp "$groupPath" $out/etc/group
  '';

  built = pkgs.dockerTools.buildLayeredImage {
    inherit (img) name tag created config;
    contents = [ tree ];
    # /tmp is HOME and WORKDIR; `docker run --read-only --tmpfs /tmp` replaces it.
    extraCommands = "mkdir -p tmp && chmod 1777 tmp";
    maxLayers = 100;
  };
in
{
  inherit wheelhouse venv assets tree python;
  image = built // { speclock = img; };
}
