"""What runs in a worker process: the Faust app factory and the worker's start-up."""
