"""Export bundles (docs/bundle.md, docs/format.md §8): the bundle's own files, its exact layout, and what a reader loads from it."""
