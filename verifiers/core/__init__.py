"""The verifiers' common core: their errors, the check-result model, claim comparison, and a receipt read with its action."""
