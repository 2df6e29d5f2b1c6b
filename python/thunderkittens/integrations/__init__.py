"""Integrations with other libraries, each in its own module that imports its library lazily
(when the module is imported, never at ``import thunderkittens``):

    from thunderkittens.integrations import transformers as tk_transformers
    tk_transformers.register()   # attn_implementation="thunderkittens"
"""
