"""Publication bundles: export and import (docs/bundle.md)."""
