"""The network as data: the ``.net`` format and its shapes, the layer kinds (one module each)
and their registry, and the typed options of a layer line."""
