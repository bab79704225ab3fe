# TEST DOUBLE for nixpkgs (see flake.nix here): `import nixpkgs { system; config; }` returns the
# few attributes speclock's flake uses. Each "package" is a derivation whose builder fails with
# a message saying it is a double; its arguments stay readable (e.g. `.speclockArgs`).
{ system ? "x86_64-linux", config ? { }, ... }:
let
  # Like a real derivation, the double's drvPath depends on its arguments: forcing it forces
  # every argument (and the derivations in them), so evaluation errors surface as they would.
  force = v:
    if builtins.isList v then map force v
    else if builtins.isAttrs v && v ? drvPath then v.drvPath
    else if builtins.isAttrs v then null
    else if builtins.isFunction v then null
    else v;
  fake = name: args: derivation {
    inherit name system;
    builder = "/bin/sh";
    args = [ "-c" "echo 'nixpkgs test double: ${name} cannot be built; use the real nixpkgs' >&2; exit 1" ];
    speclockInputs = builtins.toJSON (map force (builtins.attrValues args));
  } // { speclockArgs = args; nixpkgsConfig = config; };

  pkg = name: fake name { } // { out = fake name { }; lib = fake "${name}-lib" { }; };

  python = version: rec {
    name = "python${version}";
    drv = fake name { };
    pythonPkgs = {
      setuptools = pkg "setuptools";
      invoke = pkg "invoke";
      pytest = pkg "pytest";
      buildPythonPackage = args: fake "${args.pname}-${args.version}" args;
    };
  };
  pythonDrv = version:
    let p = python version;
    in p.drv // {
      pkgs = p.pythonPkgs;
      withPackages = f: fake "${p.name}-env" { packages = f p.pythonPkgs; };
    };

  cudaSet = v: {
    cuda_nvcc = pkg "cuda_nvcc-${v}";
    cuda_cudart = pkg "cuda_cudart-${v}";
    cuda_cuobjdump = pkg "cuda_cuobjdump-${v}";
  };
in
{
  inherit system config;
  isTestDouble = true;
  python3 = pythonDrv "3";
  python311 = pythonDrv "311";
  python312 = pythonDrv "312";
  stdenv = {
    mkDerivation = args: fake (args.name or "${args.pname}-${args.version}") args // {
      record = fake "${args.name or args.pname}-record" { };
    };
    cc.cc.lib = pkg "gcc-lib";
  };
  runCommand = name: env: script: fake name (env // { inherit script; });
  mkShell = args: fake (args.name or "shell") args;
  dockerTools.buildLayeredImage = args: fake "docker-image-${baseNameOf args.name}.tar.gz" args;
  autoPatchelfHook = pkg "auto-patchelf-hook";
  numactl = pkg "numactl";
  zlib = pkg "zlib";
  buildah = pkg "buildah";
  skopeo = pkg "skopeo";
  docker-client = pkg "docker-client";
  mmdebstrap = pkg "mmdebstrap";
  git = pkg "git";
  cudaPackages_12_8 = cudaSet "12.8";
  cudaPackages_12_9 = cudaSet "12.9";
  cudaPackages_13_0 = cudaSet "13.0";
}
