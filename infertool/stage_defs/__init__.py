"""Built-in stage definitions, one module per capability. Each module calls ``register_stage`` at
import time and must import nothing heavy (the target functions are dotted paths)."""
