# One fixed-output derivation per locked wheel (builtin:fetchurl, no nixpkgs): the lock's sha256 is
# the output hash, so Nix refuses a file whose bytes differ ("hash mismatch in fixed-output
# derivation '...-<wheel filename>.drv'"). The store name is the wheel's file name, so a wheel
# already in speclock's wheelhouse can be put in the store with
# `nix store add-file <wheelhouse>/<filename>` and satisfies the derivation without any download
# (the way to use file:// URLs of a local mirror on another machine).
let
  fetchWheel = w:
    derivation {
      name = w.filename;
      builder = "builtin:fetchurl";
      system = "builtin";
      url = w.url;
      outputHashMode = "flat";
      outputHashAlgo = "sha256";
      outputHash = w.sha256;
      # builtin:fetchurl needs these; they keep the download out of remote builders' way.
      preferLocalBuild = true;
      impureEnvVars = [ "http_proxy" "https_proxy" "ftp_proxy" "all_proxy" "no_proxy" ];
      executable = false;
      unpack = false;
    };
in
{
  inherit fetchWheel;
  # name -> derivation, for one stack's runtime wheels or its build-time assets.
  forList = ws: builtins.listToAttrs (map (w: { name = w.name; value = fetchWheel w; }) ws);
}
