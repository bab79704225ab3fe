{
  description = "speclock: reproducible EAGLE-3 speculative-decoding images; pins read from locks/*.lock (one source of truth)";

  # nixos-25.11: cudaPackages_12_8 (Blackwell sm_100/sm_120), 12_9 (sm_103) and 13_0; python311.
  # Only the outputs that need nixpkgs (packages, devShells) fetch it; lib and checks do not.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      system = "x86_64-linux"; # the locked wheels are manylinux x86_64
      root = ./.;
      revision = self.rev or "dirty";

      pins = import ./nix/pins.nix { inherit root; };
      containerfile = import ./nix/containerfile.nix { inherit root; };
      imageSpec = import ./nix/image-spec.nix { inherit root containerfile revision; };
      wheels = import ./nix/wheels.nix;

      # sm_100 -> "10.0", sm_90a -> "9.0a": nixpkgs' cudaCapabilities spelling.
      capability = arch:
        let m = builtins.match "sm_([0-9]+)([0-9])([a-z]?)" arch;
        in if m == null then throw "speclock: key gpu.archs has ${arch}; expected sm_NN[a|f]"
        else "${builtins.elemAt m 0}.${builtins.elemAt m 1}${builtins.elemAt m 2}";
      pkgs = import nixpkgs { inherit system; };
      pkgsForStack = s:
        if s.cuda == "" then pkgs
        else import nixpkgs {
          inherit system;
          config = { allowUnfree = true; cudaSupport = true; cudaCapabilities = map capability s.archs; };
        };

      images = builtins.listToAttrs (map
        (n:
          let s = pins.checked n;
          in {
            name = n;
            value = import ./nix/image.nix {
              pkgs = pkgsForStack s;
              inherit root wheels;
              stack = s;
              image = imageSpec.for s;
            };
          })
        pins.names);
    in
    {
      # Pure data, evaluable offline: `nix eval --json .#lib.stacks.cpu-vllm.engine`.
      lib = {
        stackNames = pins.names;
        # Validated pins per stack (engine, torch, CUDA, archs, patches, wheels with URL and sha256).
        # A stack file without a lock is listed too, and throws naming it when read.
        stacks = builtins.listToAttrs (map (n: { name = n; value = pins.checked n; }) pins.allNames);
        # What each stack's Nix image sets: tag, labels, layout, runtime config.
        images = builtins.listToAttrs (map (n: { name = n; value = imageSpec.for (pins.checked n); }) pins.names);
        containerfile = containerfile;
        # Stacks the flake cannot provide (stack file without a lock), as messages.
        problems = pins.coverageProblems;
        inherit capability;
      };

      checks.${system} = import ./nix/checks.nix { inherit system pins containerfile imageSpec; };

      # One fixed-output derivation per locked wheel: `nix build .#legacyPackages.x86_64-linux.wheels.<stack>.<name>`.
      legacyPackages.${system}.wheels = builtins.listToAttrs (map
        (n: { name = n; value = wheels.forList ((pins.checked n).wheels ++ (pins.checked n).assets); })
        pins.names);

      packages.${system} = builtins.listToAttrs (builtins.concatMap
        (n: [
          { name = "${n}-image"; value = images.${n}.image; }
          { name = "${n}-venv"; value = images.${n}.venv; }
          { name = "${n}-wheelhouse"; value = images.${n}.wheelhouse; }
        ])
        pins.names);

      devShells.${system} = import ./nix/shells.nix {
        inherit pkgs pkgsForStack root pins images;
        version = imageSpec.version;
      };
    };
}
