import sys
from pathlib import Path

# Tests import their helpers (tiny_models, ...) as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))
