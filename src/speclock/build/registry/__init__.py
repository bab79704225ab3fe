"""What a registry holds and what goes beside an image there: below push-image, the SBOM and the docker builder.

client (registry_digest with skopeo, RegistryClient: a small OCI distribution API client) <- referrers (an
artifact pushed with the image as its subject, found again by artifactType: the SBOM and the attestation).
"""
