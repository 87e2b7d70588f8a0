"""The benchmark's prompts: none of them was seen in training the shipped drafters."""

from __future__ import annotations

import torch

GROUNDED_TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. It was "
    "constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial anniversary of the "
    "French Revolution."
)
GROUNDED = [f"Repeat the following text exactly:\n\n{GROUNDED_TEXT}",
            f"Rewrite the following text, replacing 'tower' with 'monument':\n\n{GROUNDED_TEXT}"]
OPEN_ENDED = ["Write a short story about a lighthouse keeper.", "Explain why the sky is blue."]


def chat(tokenizer, question):
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return torch.tensor([list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)])


# Held out from the drafters' training prompts (logitlab.training.data): the prompts they are measured on.
DRAFT_PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a refrigerator keeps food cold."]
