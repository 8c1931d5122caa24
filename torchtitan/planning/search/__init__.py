"""Choosing a layout: the space of layouts, their cheap torch-free estimate, the staged layout
search (`--planning.fit=layout`) and the nearby choices the dry run prices."""
