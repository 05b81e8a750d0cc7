"""The package's folders are its layers: each imports only the layers below it (ARCHITECTURE.md draws them)."""

import ast
from pathlib import Path

import broker

ROOT = Path(broker.__file__).parent
BELOW = {
    "domain": set(),
    "models": {"domain"},
    "planning": {"domain", "models"},
    "store": {"domain"},
    "pricing": {"domain", "store"},
    "agents": {"domain", "store", "pricing"},
    "sdk": {"agents"},
    "bubbles": {"domain", "models", "store", "agents", "sdk"},
    "core": {"domain", "models", "planning", "store", "pricing", "agents"},
    "sim": {"domain", "models", "planning", "store", "pricing", "agents", "bubbles", "core"},
}


def layer_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        layer = parts[0] if len(parts) > 1 else path.stem
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "broker":
                names = node.module.split(".")
                used = names[1] if len(names) > 1 else node.names[0].name
                if used != layer:
                    found.setdefault(layer, set()).add(used)
    return found


def test_every_layer_imports_only_the_layers_below_it():
    wrong = {layer: sorted(used - BELOW[layer]) for layer, used in layer_imports().items() if layer in BELOW}
    assert {layer: used for layer, used in wrong.items() if used} == {}


def test_every_folder_is_a_known_layer():
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(BELOW) - {"sdk"} | {"app"}
