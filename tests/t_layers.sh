#!/usr/bin/env bash
# The layers depend downward only (README "Layout"): util < models < costdb <
# planner < executor < profile < cli. A file of one folder that includes a
# header of a folder above it fails, naming the file and the include.
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
LAYERS="util models costdb planner executor profile cli"
bad=""
below=""
for layer in $LAYERS; do
    below="$below $layer"
    for f in "$layer"/*.c "$layer"/*.h "$layer"/*.cu "$layer"/*.cuh; do
        [ -e "$f" ] || continue
        while IFS= read -r inc; do
            dir=${inc%%/*}
            case " $LAYERS " in *" $dir "*) ;; *) continue;; esac
            case " $below " in *" $dir "*) ;; *) bad="$bad $f -> $inc;";; esac
        done < <(sed -n 's/^#include "\([a-z_]*\/[^"]*\)".*/\1/p' "$f")
    done
done
if [ -z "$bad" ]; then ok layers_depend_downward_only; else fail layers_depend_downward_only "$bad"; fi
