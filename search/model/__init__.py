"""One model of a step: its shapes, its states and buffers (placement), its activations and moments, its seconds."""
