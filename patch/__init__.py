"""The RFC as a patch to pytorch-lightning 2.6.6, and Lightning's own tests run against stock and patched packages."""
