"""The model-checkpoint layer: checkpoint/1 and params/1 records, and parameter distance."""
