"""drafter: target/drafter model folders and their manifest, the EAGLE-3 drafter network, the reference decoder.

Below both verify/ (smoke judges a drafter) and train/ (training makes one)."""
