"""The benchmark's prompts: none of them was seen in training the shipped drafters."""

from __future__ import annotations

import torch

from ..models import chat_ids

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
    return torch.tensor([chat_ids(tokenizer, question)])


def cached_prefix(tokenizer) -> list[int]:
    """The cached prefix every pass is timed after (v(n), llama.cpp, the cost model's prices): a
    chat prompt and 160 more tokens, about 200 in all, the length of a short answer."""
    return chat(tokenizer, "Summarise the history of the printing press in a few sentences.")[0].tolist() + list(
        range(1000, 1160))


# Held out from the drafters' training prompts (logitlab.training.data): the prompts they are measured on.
DRAFT_PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a refrigerator keeps food cold."]

# The cost model's calibration prompts (logitlab.bench.costmodel): held out from the drafters'
# training too, and different from the prompts the rows are timed on, so that the predicted
# speedup of a row is a forecast, not a fit.
CALIBRATION = ["Describe how to make a cup of tea.", "What are the benefits of regular exercise?"]
CALIBRATION_TEXT = (
    "The Amazon is the largest river in South America by the volume of water it carries. It rises in the Andes "
    "of Peru and flows east for about 6,400 kilometres to the Atlantic Ocean, through the largest tropical "
    "rainforest on Earth, which its basin of some seven million square kilometres drains."
)
CALIBRATION_GROUNDED = [f"Repeat the following text exactly:\n\n{CALIBRATION_TEXT}",
                        f"Rewrite the following text, replacing 'river' with 'stream':\n\n{CALIBRATION_TEXT}"]
