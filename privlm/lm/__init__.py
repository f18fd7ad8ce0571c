"""LM primitives below training and synthesis: prompt layout and label words (:mod:`.prompts`), option
scoring (:mod:`.scoring`), sampling settings and seeded generation (:mod:`.sampling`, :mod:`.generation`),
hidden-state features (:mod:`.features`), label-word fine-tuning (:mod:`.finetune`) and prompt → completion
encoding with a loss mask and greedy decoding (:mod:`.completion`)."""
