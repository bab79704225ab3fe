"""spec: what the user declares and what it resolves to: stack, lock, base image, smoke prompts."""
