# Offline checks: each is a derivation that needs no nixpkgs (its builder is /bin/sh, which Nix
# provides in its sandbox on NixOS and standard installs; on Debian's nix-bin run with
# `--option sandbox false`). All the checking happens at evaluation, from the lock files, the
# stack files and the Containerfile: a failing check is an evaluation error naming the stack
# and key. The output is a small JSON summary of what was checked.
{ system, pins, containerfile, imageSpec }:
let
  u = import ./util.nix;
  summary = name: value: derivation {
    name = "speclock-check-${name}";
    inherit system;
    builder = "/bin/sh";
    args = [ "-c" "echo \"$summary\" > $out" ];
    summary = builtins.toJSON value;
  };
  require = problems: value:
    if problems == [ ] then u.deepForce value
    else u.fail (builtins.concatStringsSep "\n  " ([ "check failed:" ] ++ problems));
  perStack = name:
    let
      s = pins.checked name;
      img = imageSpec.for s;
    in
    summary "stack-${name}" {
      stack = name;
      inherit (s) engine torch cuda archs patches counts lockSha256;
      python = s.python.version;
      image = { inherit (img) ref labels layout; };
    };
in
{
  # Every stacks/*.toml has a lock the flake reads, and every lock has its stack file.
  stacks-have-locks = summary "stacks-have-locks" pins.coverage;
  # The Containerfile's runtime stage and the Nix image agree on destinations, user, entrypoint.
  containerfile = summary "containerfile" (require imageSpec.destinationProblems {
    inherit (containerfile) user workdir entrypoint cmd env copyDestinations;
  });
} // builtins.listToAttrs (map (n: { name = "stack-${n}"; value = perStack n; }) pins.names)
