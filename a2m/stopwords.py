"""Function words per language, for the tokenizer's language detection and filtering.

Short lists on purpose: only words that carry no content in any context. A word
that is a function word in one language and content in another (`die`, `son`)
is removed only when that language is the one detected.
"""

from __future__ import annotations

STOPWORDS: dict[str, frozenset[str]] = {
    "en": frozenset("""a about above after again against all am an and any are as at be because been before being
        below between both but by can could did do does doing down during each few for from further had has have
        having he her here hers herself him himself his how i if in into is it its itself just me more most my myself
        no nor not now of off on once only or other our ours ourselves out over own same she should so some such than
        that the their theirs them themselves then there these they this those through to too under until up very was
        we were what when where which while who whom why will with would you your yours yourself yourselves
        s t don shall may might must also ever""".split()),
    "it": frozenset("""il lo la i gli le un uno una di a da in con su per tra fra e ed o ma se che chi cui non piu
        del dello della dei degli delle al allo alla ai agli alle dal dallo dalla dai dagli dalle nel nello nella nei
        negli nelle sul sullo sulla sui sugli sulle mi ti si ci vi ne io tu lui lei noi voi loro mio mia miei mie tuo
        tua suo sua nostro nostra vostro vostra sono sei siamo siete era erano essere ho hai ha abbiamo avete hanno
        questo questa questi queste quello quella come dove quando anche gia molto poco""".split()),
    "de": frozenset("""der die das den dem des ein eine einer eines einem einen und oder aber nicht ist sind war
        waren sein bin bist seid hat haben habe hatte ich du er sie es wir ihr mich dich sich uns euch mein dein sein
        unser euer zu mit von fur auf an in im am um aus bei nach vor uber unter durch als wie wenn dass so auch noch
        nur sehr wo was wer welche welcher dieser diese dieses jener kein keine""".split()),
    "fr": frozenset("""le la les un une des du de d l et ou mais donc or ni car ne pas plus que qui quoi dont ou
        je tu il elle nous vous ils elles me te se moi toi lui leur leurs mon ma mes ton ta tes son sa ses notre
        votre nos vos ce cet cette ces est sont etait etre ai as avons avez ont a au aux en dans sur sous par pour
        avec sans chez comme quand si y tres aussi deja""".split()),
    "es": frozenset("""el la los las un una unos unas y o pero ni que quien cual cuyo de del al a en con por para
        sin sobre entre hasta desde yo tu el ella nosotros vosotros ellos ellas me te se nos os le les lo mi mis tu
        tus su sus nuestro vuestro este esta estos estas ese esa eso aquel es son era eran ser estar esta estan ha
        han he has hemos muy mas tambien ya como cuando donde si no""".split()),
    "pt": frozenset("""o a os as um uma uns umas e ou mas que quem de do da dos das em no na nos nas por para com
        sem sobre entre ate eu tu ele ela nos vos eles elas me te se lhe lhes meu minha seu sua nosso este esta isto
        esse essa isso aquele e sao era eram ser estar foi tem ha muito mais tambem ja como quando onde nao""".split()),
    "nl": frozenset("""de het een en of maar niet is zijn was waren ben bent heb hebt heeft hebben ik jij je hij zij
        ze wij we jullie mij me hem haar ons hun mijn jouw zijn onze van in op aan met voor naar uit bij door over
        onder als dat die dit deze wat wie waar hoe ook nog al zo er""".split()),
    "ru": frozenset("""и в во не что он на я с со как а то все она так его но да ты к у же вы за бы по только ее
        мне было вот от меня еще нет о из ему теперь когда даже ну вдруг ли если уже или ни быть был него до вас
        нибудь опять уж вам ведь там потом себя ничего ей может они тут где есть надо ней для мы тебя их чем была
        сам чтоб без будто чего раз тоже себе под будет ж тогда кто этот того потому этого какой совсем ним здесь
        этом один почти мой тем чтобы нее сейчас были куда зачем всех никогда можно при наконец два об другой хоть
        после над больше тот через эти нас про всего них какая много разве три эту моя впрочем хорошо свою этой
        перед иногда лучше чуть том нельзя такой им более всегда конечно всю между""".split()),
}
