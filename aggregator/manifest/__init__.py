"""The manifest: loading (YAML with marks, ${ENV}), validation (JSON Schema, cross-references), the typed model."""

from aggregator.manifest.load import load_manifest, parse_manifest
from aggregator.manifest.model import Manifest, ManifestError, ManifestIssue
from aggregator.manifest.schema import load_schema, schema_text

__all__ = ["Manifest", "ManifestError", "ManifestIssue", "load_manifest", "load_schema", "parse_manifest", "schema_text"]
