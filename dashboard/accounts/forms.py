from django import forms


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        required=False,
        help_text="What the token is for, e.g. “laptop” or “CI”.",
        widget=forms.TextInput(attrs={"placeholder": "laptop"}),
    )
