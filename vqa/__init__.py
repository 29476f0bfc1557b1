"""vqa: visual question answering and captioning."""
