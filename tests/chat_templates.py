"""Chat templates the HF data tests set on a processor (the tiny models' own have no tool support)."""

# A Qwen2.5 / Qwen3 style template with tool support (the hub's Qwen2-VL one has none):
# tools in the system turn, calls as <tool_call> JSON, responses grouped in one user turn.
TOOL_TEMPLATE = (
    "{%- macro text(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
    "{%- for c in content -%}"
    "{%- if c.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif c.type == 'text' -%}{{- c.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n<tools>' -}}{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools><|im_end|>\\n' -}}"
    "{%- elif messages[0].role != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not tools -%}{{- '<|im_start|>system\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + text(message.content) -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + "
    "'\", \"arguments\": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' -}}{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _with_video(template: str) -> str:
    """A Qwen template with the hub's video branch: ``<|vision_start|><|video_pad|><|vision_end|>``
    for each video part (``vlmcp init-model``'s templates render images only)."""
    video = ("{% elif content['type'] == 'video' or 'video' in content %}"
             "{% set video_count.value = video_count.value + 1 %}"
             "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
             "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}")
    out = template.replace("{% elif 'text' in content %}", video, 1)
    out = "{% set video_count = namespace(value=0) %}" + out
    assert out.count("<|video_pad|>") == 1
    return out
