"""Jinja2 templates of the generated program (shipped as package data gcompile.codegen_templates)."""
