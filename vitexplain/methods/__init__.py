"""Built-in explanation methods, one module each; the method registry imports them all before its first
lookup (a module whose name starts with ``_`` holds shared helpers)."""
