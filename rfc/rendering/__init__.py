"""The RFC's render tool as a package; ``rfc/render.py`` is its command line.

``results`` loads and checks the JSON once; ``conformance``, ``benchmarks``, ``plots`` and ``standing`` turn it into
Markdown blocks; ``pages`` fills the blocks into pages and writes or checks them.
"""
