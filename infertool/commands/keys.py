"""`infertool keys new DIR`: an EC P-256 key pair to sign published folders with (`publish --sign-key`) and to
check them by (`verify --key`, `serve --key`)."""


from pathlib import Path
from typing import Annotated

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, examples, force_opt, handle_errors

keys_app = typer.Typer(help="Key pairs that sign published folders (model-signing, EC P-256).", no_args_is_help=True)

EXAMPLES = examples(
    ("infertool keys new ~/.infertool-keys", "private.pem (mode 0600) and public.pem; prints the key's fingerprint"),
    ("infertool publish out/runs/quickstart-<time> /models/smollm2-w4 --sign-key ~/.infertool-keys/private.pem",
     "sign what you publish"),
    ("infertool verify /models/smollm2-w4 --key ~/.infertool-keys/public.pem", "refuse it unless signed by that key"),
)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")


@keys_app.command("new", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def keys_new(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="The folder for private.pem and public.pem (made if needed).")],
    force: Annotated[bool, force_opt("Replace a key pair already in DIR.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Write a new EC P-256 key pair: DIR/private.pem (mode 0600, keep it to yourself) and DIR/public.pem (give it
    to whoever checks what you publish)."""
    from infertool.output import err, esc, print_json
    from infertool.signing import new_key_pair

    pair = new_key_pair(folder, force=force)
    if as_json:
        print_json(pair.to_dict())
        return
    err.print(f"[green]wrote[/] {esc(pair.private_key)} (private, mode 0600) and {esc(pair.public_key)}",
              soft_wrap=True)
    typer.echo(f"fingerprint {pair.fingerprint}")
