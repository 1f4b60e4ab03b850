"""The compiler's subcommands (`gcompile build | inspect | run`), one module each, each with
`add_arguments(parser)` and `run(args)`; gcompile/cli.py lists them. `model_file` loads a model file."""
