"""The weights room: reading and writing weights files, ours (checkpoint folders, the shipped towers in
vqa/weights/<name>/, LoRA adapters) and other people's (GPT-2 and Llama-layout language models, the Hugging Face
VisionEncoderDecoder layout, the Hub). vqa.model holds the architecture alone."""
