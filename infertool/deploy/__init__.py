"""Deployment artefacts generated from the recipe (Kubernetes manifests)."""
