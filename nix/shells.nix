# Dev shells: the build host's tools, and one shell per stack with the locked engine environment
# (the same venv derivation as the image) plus the stack's CUDA toolkit from nixpkgs.
{ pkgs, pkgsForStack, root, version, images, pins }:
let
  u = import ./util.nix;
  py = pkgs.python3;
  speclockPackage = ps: ps.buildPythonPackage {
    pname = "speclock";
    inherit version;
    src = root;
    pyproject = true;
    build-system = [ ps.setuptools ];
    doCheck = false;
  };
  srcOnPath = ''export PYTHONPATH="$PWD/src''${PYTHONPATH:+:$PYTHONPATH}"'';

  cudaFor = s:
    let attr = "cudaPackages_" + builtins.replaceStrings [ "." ] [ "_" ] s.cuda;
        p = pkgsForStack s;
    in
    if s.cuda == "" then [ ]
    else if !(p ? ${attr}) then u.fail "stack ${s.name}: key gpu.cuda is ${s.cuda}, but the pinned nixpkgs has no ${attr}; update the nixpkgs input (flake.lock)"
    else [ p.${attr}.cuda_nvcc p.${attr}.cuda_cudart p.${attr}.cuda_cuobjdump ];

  stackShell = name:
    let s = pins.checked name;
    in (pkgsForStack s).mkShell {
      name = "speclock-${name}";
      packages = [ images.${name}.venv ] ++ cudaFor s;
      SPECLOCK_STACK = name;
      SPECLOCK_LOCK_SHA256 = s.lockSha256;
      shellHook = ''
        ${srcOnPath}
        echo "speclock stack ${name}: ${s.engine.package} ${s.engine.version}, torch ${s.torch.version}, CUDA ${if s.cuda == "" then "none" else s.cuda}${if s.archs == [ ] then "" else " (" + builtins.concatStringsSep "," s.archs + ")"}, lock ${builtins.substring 0 12 s.lockSha256}"
      '';
    };
in
{
  # The build host: Python with speclock, invoke and pytest; buildah, skopeo, the docker client.
  default = pkgs.mkShell {
    name = "speclock-host";
    packages = [
      (py.withPackages (ps: [ (speclockPackage ps) ps.invoke ps.pytest ]))
      pkgs.buildah
      pkgs.skopeo
      pkgs.docker-client
      pkgs.mmdebstrap
      pkgs.git
    ];
    shellHook = srcOnPath;
  };
} // builtins.listToAttrs (map (n: { name = n; value = stackShell n; }) pins.names)
