"""`python -m worker`: the `worker` program, for when its script is not on the PATH."""

from worker.cli import main

main()
