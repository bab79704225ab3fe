"""build: the build context and Containerfile, the builders, the wheelhouse, running and pushing images;
hostenv/, sbom/ and registry/ hold the host-env, SBOM and registry families (docs/architecture.md)."""
