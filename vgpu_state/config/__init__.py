"""Config language: YAML with positions, validation, node selection, resolution onto GPUs."""
