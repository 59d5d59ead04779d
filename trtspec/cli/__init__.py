"""The `trtspec` command line: thin commands that parse, call the library and render."""
