"""What several test modules share: a trial run the way the trial actor runs it, a fake OpenAI server,
the KubeRay schemas, the vLLM engine processes of a test."""
