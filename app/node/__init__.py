"""What runs on a GPU node: the node process (:mod:`.runtime`) and its durable outbox."""
