"""The package list, computed because pyproject.toml cannot say "if the folder exists".

Ships every Python package under gcompile/ (those with an __init__.py; a new subpackage needs no edit
here) and the top-level folders codegen_templates/ and runtime/ as the data packages
gcompile.codegen_templates and gcompile.runtime, each once its folder exists (git keeps no empty
folders). Their file patterns are in pyproject.toml, like everything else about the project.
Give those two folders an __init__.py: without one, an editable install (`make install`) cannot import
them, as setuptools' editable finder does not resolve a remapped folder without it.
"""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
DATA_PACKAGES = {"gcompile.codegen_templates": "codegen_templates", "gcompile.runtime": "runtime"}
present = {package: folder for package, folder in DATA_PACKAGES.items() if (HERE / folder).is_dir()}

setup(packages=find_packages(include=["gcompile", "gcompile.*"]) + list(present), package_dir=present)
