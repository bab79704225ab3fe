"""The image's SBOM (CycloneDX JSON, docs/sbom.md): made from the lock at build time, pushed beside the image.

document (sbom_text, stage_sbom, `speclock sbom`) <- cache (build-image's reuse by key), from format (library,
schema, paths, media type), packages (the components) and rootfs (the base's Debian packages); referrer pushes
and pulls it through build.registry.
"""
