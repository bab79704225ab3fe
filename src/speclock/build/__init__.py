"""build: the build context and Containerfile, the builders, the wheelhouse, running and pushing images."""
