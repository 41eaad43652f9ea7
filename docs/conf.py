"""Sphinx configuration: the pages are Markdown (MyST); the API reference is generated from the
docstrings (autodoc, NumPy style). ``make docs`` builds with every warning an error and every
cross-reference checked (nitpicky), so a page or docstring naming a module, class, function or
section that no longer exists fails the build."""

project = "hpctrain"
copyright = "the hpctrain developers"
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}  # autosummary writes .rst
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # links to sections: page.md#a-heading
myst_enable_extensions = ["colon_fence"]
autosummary_generate = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
napoleon_google_docstring = False
napoleon_numpy_docstring = True
nitpicky = True
html_theme = "alabaster"
html_title = "hpctrain"
# A Parameters entry is written "name : what it is" (prose, not a type): shown, not looked up.
napoleon_use_param = False
napoleon_preprocess_types = False
# Types from outside the package (the standard library, NumPy, MPI, h5py) have no pages here.
nitpick_ignore_regex = [
    (r"py:(class|obj|data|mod)", r"(collections\.abc|pathlib|numpy|np|argparse|mpi4py|MPI"
                                 r"|importlib|types|typing|h5py|dataclasses|re)(\..*)?"),
    # a private helper type in a public signature has no page (private members are not shown)
    (r"py:class", r"hpctrain\..*\._\w+"),
    (r"py:(class|obj|data)", r"(Any|Path|Callable|Sequence|Iterator|Iterable|Mapping|NoReturn"
                             r"|ClassVar|TypeVar|Protocol|ModuleType|Traversable|T)"),
]
