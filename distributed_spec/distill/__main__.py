"""python -m distributed_spec.distill: see the package docstring."""

from distributed_spec.distill.cli import main

if __name__ == "__main__":
    main()
