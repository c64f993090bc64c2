"""Cost-quality decisions, the app above billing, training and inference (nothing below imports
it): build or buy (buildbuy), counterfactual routing replays (replay) and the recommendations
derived from them (recommendations). Models are in decisions.models, one module per family."""
