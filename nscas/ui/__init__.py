"""``nscas ui``: a read-only web app over a store (docs/ui.md).

``app`` builds the aiohttp application and its security headers, ``routes`` the pages,
``views`` what they show (read from the store), ``comparison`` the compare page, ``render`` and
``templates/`` the HTML,
``graph`` the lineage layout, ``charts`` the journal curves, ``preview`` the blob previews.
The verify button runs ``nscas verify --stream`` in a process of its own: nothing here
imports the verifiers.
"""
