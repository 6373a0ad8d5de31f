"""The sections of a config file, each checked by its own module.

``context`` holds what every section shares (the issues of the file, the
catalog, the positions, and :func:`~vgpu_state.config.sections.context.known_keys`,
the one place that reports unknown keys); ``configs`` checks ``vgpu-configs``
and its entries, ``policy`` the policy mappings, ``selectors`` the
``node-selectors`` and ``default``. ``vgpu_state.config.loader`` checks the top
level and builds the document.
"""
