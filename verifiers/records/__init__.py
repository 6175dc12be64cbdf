"""Objects, records and their closure (docs/format.md §1-3, §5): IDs, strict record reading, the ten kinds' schemas, object sources, the action and environment records."""
