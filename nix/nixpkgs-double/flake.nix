# TEST DOUBLE for nixpkgs, used ONLY by tests/test_nix_flake.py through
# `--override-input nixpkgs path:nix/nixpkgs-double`, to evaluate the SHAPE of the outputs that
# need nixpkgs (packages, devShells) on a machine where nixpkgs cannot be fetched. Its
# derivations record their arguments and fail if anyone tries to build them.
{
  description = "speclock test double for nixpkgs (shape evaluation only; builds nothing)";
  outputs = { self }: { };
}
