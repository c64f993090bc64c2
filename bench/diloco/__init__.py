"""`manage.py bench diloco` (or `python -m bench.diloco.run`, no Django): DiLoCo against
data-parallel training on the engine's simulator. The command and its summary (run), the profiles
and run specs (specs), running one spec (runs), the chart (chart); recorded figures in results/."""
