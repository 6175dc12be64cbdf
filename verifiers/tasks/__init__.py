"""Task sets and conversations (docs/experiment.md §1-2): the strict checker, regenerated task sets, the stand-in sets, the selection redone, chat templates."""
