"""``orchestrator make-model``: a model directory with no download."""

from __future__ import annotations

from orchestrator.commands.common import EXIT_OK, EXIT_USAGE, err
from orchestrator.models.modelgen import make_model_dir
from orchestrator.models.training import RECIPES


def cmd_make_model(args) -> int:
    try:
        path = make_model_dir(args.shape, args.out, weights=args.weights, max_position_embeddings=args.max_len,
                              seed=args.seed, force=args.force, recipe=args.recipe)
    except (FileNotFoundError, ValueError) as e:
        err(f"make-model: {e}")
        return EXIT_USAGE
    recipe = f", recipe: {args.recipe}" if args.weights == "trained" else ""
    print(f"wrote {path} ({args.shape}, weights: {args.weights}{recipe})")
    return EXIT_OK


def register(sub) -> None:
    m = sub.add_parser("make-model", help="write a model directory (config, tokenizer, optional random or "
                                          "trained weights)")
    m.add_argument("shape", help="catalog name (search_spaces/models/NAME.json) or a config.json path")
    m.add_argument("out", help="directory to write")
    m.add_argument("--weights", choices=["none", "random", "trained"], default="none",
                   help="none: for vLLM load_format=dummy; random: tiny random safetensors (small models); "
                        "trained: train on the generated grammar corpus (training.json records how)")
    m.add_argument("--recipe", choices=sorted(RECIPES), default="tiny",
                   help="training recipe of --weights trained: tiny (CPU, minutes), base (~103 M parameters, "
                        "a GPU when there is one); a directory already trained by it is kept")
    m.add_argument("--max-len", type=int, help="override max_position_embeddings")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--force", action="store_true", help="random weights even for a large shape")
    m.set_defaults(func=cmd_make_model)
